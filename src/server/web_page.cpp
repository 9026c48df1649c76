// The chat page served at "/": one self-contained HTML file (no external assets), talking to
// /v1/chat/completions with streaming. Text is inserted with textContent, never as HTML.
#include "server/api.h"

namespace qwen36::server {

const char* const kWebPage = R"QWEN36PAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>qwen36 chat</title><link rel="icon" href="data:,">
<style>
body{font-family:system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#fafafa}
header{padding:8px 12px;background:#222;color:#eee;display:flex;gap:12px;align-items:center;flex-wrap:wrap;font-size:13px}
header input{width:60px}header input[type=checkbox]{width:auto}#seed{width:80px}#key{width:140px}
#log{flex:1;overflow:auto;padding:12px}
.msg{max-width:800px;margin:8px auto;padding:8px 12px;border-radius:8px;white-space:pre-wrap;overflow-wrap:anywhere}
.user{background:#dbeafe}.assistant{background:#fff;border:1px solid #ddd}
details{color:#666;font-size:90%;margin-bottom:4px}summary{cursor:pointer;user-select:none}
.reasoning{border-left:3px solid #ddd;padding-left:8px;margin-top:4px}
pre{background:#f3f3f3;padding:6px;margin:4px 0;overflow:auto;white-space:pre}code{background:#f3f3f3;border-radius:3px;font-size:92%}pre code{background:none}
.tool{font-family:monospace;background:#fef3c7;padding:4px;margin-top:4px}
.meta{color:#888;font-size:12px;margin-top:4px}
.err{color:#b91c1c}
form{display:flex;gap:8px;padding:12px;max-width:824px;margin:0 auto;width:100%;box-sizing:border-box}
textarea{flex:1;height:60px}
</style></head><body>
<header><b>qwen36</b>
<label>temperature <input id="temp" type="number" step="0.1" min="0" max="2" value="0.7"></label>
<label>top_p <input id="topp" type="number" step="0.05" min="0" max="1" value="0.95"></label>
<label>max tokens <input id="maxt" type="number" min="1" value="512"></label>
<label>seed <input id="seed" type="number" placeholder="random"></label>
<label><input id="think" type="checkbox" checked> thinking</label>
<label>API key <input id="key" type="password"></label>
<button id="clear" type="button">new chat</button></header>
<div id="log"></div>
<form id="f"><textarea id="in" placeholder="Message (Enter to send, Shift+Enter for a new line)"></textarea>
<button id="send">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<script>
const $=id=>document.getElementById(id);let history=[],ctrl=null;
function el(tag,cls,text){const e=document.createElement(tag);if(cls)e.className=cls;if(text!==undefined)e.textContent=text;return e}
function box(cls){const d=el('div','msg '+cls);$('log').appendChild(d);return d}
// Markdown subset, built as DOM nodes (model text never becomes HTML): ``` fences, `code`, **bold**.
function inline(parent,text){text.split(/(`[^`\n]+`)/).forEach(s=>{if(/^`[^`\n]+`$/.test(s))parent.appendChild(el('code','',s.slice(1,-1)));
 else s.split(/(\*\*[^*\n]+\*\*)/).forEach(t=>{if(/^\*\*[^*\n]+\*\*$/.test(t))parent.appendChild(el('strong','',t.slice(2,-2)));else if(t)parent.appendChild(document.createTextNode(t))})})}
// The newline next to a fence belongs to the fence (a <pre> is a block already).
function render(target,text){target.textContent='';const parts=text.split('```');parts.forEach((p,i)=>{if(i%2){const pre=el('pre');pre.appendChild(el('code','',p.replace(/^[\w+.-]*\n/,'').replace(/\n$/,'')));target.appendChild(pre)}
 else{if(i>0)p=p.replace(/^\n/,'');if(i<parts.length-1)p=p.replace(/\n$/,'');inline(target,p)}})}
function num(id,def){const v=parseFloat($(id).value);return Number.isFinite(v)?v:def}
function busy(on){$('stop').disabled=!on;$('send').disabled=on}
$('clear').onclick=()=>{if(ctrl)ctrl.abort();history=[];$('log').textContent=''};
$('in').onkeydown=e=>{if(e.key==='Enter'&&!e.shiftKey&&!e.isComposing){e.preventDefault();$('f').requestSubmit()}};
$('stop').onclick=()=>{if(ctrl)ctrl.abort()};
$('f').onsubmit=async e=>{e.preventDefault();const text=$('in').value.trim();if(!text||ctrl)return;$('in').value='';
 const turn=history;turn.push({role:'user',content:text});box('user').textContent=text;
 const a=box('assistant'),det=el('details'),sum=el('summary','','thinking…'),rs=el('div','reasoning'),body=el('div','body'),tools=el('div','tools'),meta=el('div','meta');
 det.append(sum,rs);det.hidden=true;a.append(det,body,tools,meta);
 let content='',reasoning='',calls=[],usage=null,failed=false;const c=ctrl=new AbortController(),t0=performance.now();busy(true);
 const headers={'Content-Type':'application/json'};if($('key').value)headers.Authorization='Bearer '+$('key').value;
 const log=$('log'),follow=()=>{if(log.scrollHeight-log.scrollTop-log.clientHeight<80)requestAnimationFrame(()=>log.scrollTop=log.scrollHeight)};
 try{const r=await fetch('/v1/chat/completions',{method:'POST',headers,signal:c.signal,body:JSON.stringify({messages:turn,stream:true,
   temperature:num('temp',0.7),top_p:num('topp',1)||1,max_tokens:Math.max(1,Math.round(num('maxt',512))),seed:$('seed').value===''?undefined:Math.round(num('seed',0)),
   chat_template_kwargs:{enable_thinking:$('think').checked}})});
  if(!r.ok){const j=await r.json().catch(()=>null);throw new Error(j&&j.error?j.error.message:r.status+' '+r.statusText)}
  const rd=r.body.getReader(),dec=new TextDecoder();let buf='';
  for(;;){const {value,done}=await rd.read();if(done)break;buf+=dec.decode(value,{stream:true});let i;
   while((i=buf.indexOf('\n\n'))>=0){const ev=buf.slice(0,i);buf=buf.slice(i+2);if(!ev.startsWith('data: '))continue;const d=ev.slice(6);if(d==='[DONE]')continue;
    const j=JSON.parse(d);if(j.error)throw new Error(j.error.message);if(j.usage)usage=j.usage;const ch=j.choices&&j.choices[0];if(!ch)continue;const dl=ch.delta||{};
    if(dl.reasoning_content){if(det.hidden){det.hidden=false;det.open=true}reasoning+=dl.reasoning_content;rs.textContent=reasoning}
    if(dl.content){if(!content&&reasoning)det.open=false;content+=dl.content;render(body,content)}
    (dl.tool_calls||[]).forEach(t=>{calls.push(t);tools.appendChild(el('div','tool','tool call: '+t.function.name+'('+t.function.arguments+')'))});
    follow()}}
 }catch(err){if(err.name!=='AbortError'){failed=true;a.appendChild(el('div','err',String(err.message||err)))}}
 det.open=false;sum.textContent='reasoning';
 const secs=(performance.now()-t0)/1000;
 meta.textContent=(c.signal.aborted?'stopped · ':'')+(usage?usage.completion_tokens+' tokens · '+(usage.completion_tokens/secs).toFixed(1)+' tok/s':'')+(usage&&usage.prompt_tokens_details&&usage.prompt_tokens_details.cached_tokens?' · '+usage.prompt_tokens_details.cached_tokens+' prompt tokens cached':'');
 if(turn===history){if(failed&&!content&&!calls.length)turn.pop();  // a failed turn is not sent again
  else{const m={role:'assistant',content};if(calls.length)m.tool_calls=calls.map(x=>({id:x.id,type:'function',function:x.function}));turn.push(m)}}
 if(ctrl===c){ctrl=null;busy(false)}};
</script></body></html>
)QWEN36PAGE";

}  // namespace qwen36::server
